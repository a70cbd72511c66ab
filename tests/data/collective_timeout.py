"""A DDP strategy whose collectives (barriers, all-reduces) time out after a few seconds, but not its rendezvous.

`DDPStrategy(timeout=...)` sets both: init_process_group's TCPStore rendezvous and every later collective. On
a loaded 2-core machine the two processes can start 10+ s apart, so a rendezvous with a short timeout fails
before any data work. This strategy joins the group with the default timeout, then shortens the group's own
timeout, so a rank held at a barrier by another rank's data work fails within `collective_timeout_s`.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from lightning.pytorch.strategies import DDPStrategy
from torch.distributed.distributed_c10d import _set_pg_timeout


class CollectiveTimeoutDDP(DDPStrategy):
    def __init__(self, collective_timeout_s: float = 5.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.collective_timeout_s = collective_timeout_s

    def setup_distributed(self) -> None:
        super().setup_distributed()
        _set_pg_timeout(timedelta(seconds=self.collective_timeout_s))
