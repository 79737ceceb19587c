"""The emulators users can run: ``jupyter cloudtik emulator huaweicloud ...``."""

from jupyter_cloudtik.core.features import Feature

FEATURE = Feature("emulators", cli=("cloudtik_emulators.emulator_cli",))
