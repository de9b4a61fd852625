"""What Google charges: pricing (the Cloud Billing Catalog: the SKUs a cluster's VMs bill, their list
prices) and cost (on-demand, Spot and Flex-start quotes for a cluster's VMs from the catalog, or the dated
table prices.json as fallback; the rate a budget is held to, Quote.for_budget) and quoter (Quoter: the Quote
of a cluster's VMs as Terraform applied them, held by GcpBackend and handed to its other collaborators).

May import: the cloud room and the bottom layer (gpus, errors). Outside tfcluster/backends/gcp/, only
what __all__ names.
"""

from tfcluster.backends.gcp.prices.cost import PRICES, Quote, hourly_cost, quote

__all__ = ["PRICES", "Quote", "hourly_cost", "quote"]
