"""An emulator of the Huawei Cloud APIs that jupyter_cloudtik's huaweicloud provider uses.

Start it with ``jupyter cloudtik emulator huaweicloud`` (or ``python -m
cloudtik_emulators.huaweicloud``), point the provider's ``endpoint`` at it, and the
official huaweicloudsdk* clients talk to it over HTTP: ECS, VPC, EIP, NAT, IAM, IMS, KPS and
OBS calls, signature checks, quotas, pagination, asynchronous jobs, injected faults, and
servers that boot by running their user data as local processes.
"""

from .control import EmulatorControl
from .server import Emulator, Options

__all__ = ["Emulator", "EmulatorControl", "Options"]
