"""The emulators users can run: ``jupyter cloudtik emulator huaweicloud ...``."""

from ..core.features import Feature

FEATURE = Feature("emulators", cli=("jupyter_cloudtik.emulator_cli",))
