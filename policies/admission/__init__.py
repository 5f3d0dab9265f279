"""Admission policies: at arrival, admit the request or reject it with a reason.

One module per policy: `Params` (the frozen dataclass of its `admission.params`, with its
defaults), `kernel` (numba) and `reference` (its plain-Python twin) over an `AdmissionView`
(policies/admission/_view.py), `REASON` (the reject reason it records, one of
replay.engine.common.REJECT_NAMES), `READS_POOL` (it reads the pool's queue totals) and
`SPECS`. The parameters reach the engines as one integer row per pool (`Params.columns()`).
"""

from policies.admission.always import AlwaysParams
from policies.admission.priority_shed import PriorityShedParams
from policies.admission.queue_limit import QueueLimitParams
from policies.admission.slo_aware import SloAwareParams
from policies.admission.token_bucket import TokenBucketParams

__all__ = ["AlwaysParams", "PriorityShedParams", "QueueLimitParams", "SloAwareParams", "TokenBucketParams"]
