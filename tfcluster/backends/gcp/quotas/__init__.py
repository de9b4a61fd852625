"""Quota as Google keeps it: quota (every quota a cluster's VMs consume, where Google reports each, how a
shortfall reads: Need, Reading, Verdict, Zones) and quota_source (where each is read: Compute's
regions.get, Cloud Quotas, Cloud Monitoring; the zones judged with them; `preflight_quota`).

May import: the cloud room and the bottom layer (gpus, errors). Outside tfcluster/backends/gcp/, only
what __all__ names.
"""

from tfcluster.backends.gcp.quotas.quota_source import QuotaSource, judge_zones, preflight_quota

__all__ = ["QuotaSource", "judge_zones", "preflight_quota"]
