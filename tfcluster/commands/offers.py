"""`invoke offers`: the zones that offer a GPU, with the price of one VM and the project's free
quota in each region, cheapest first (tfcluster/backends/gcp/zones/offers.py asks Google); without a
project, one VM's price from the dated table."""

from __future__ import annotations

from tfcluster.commands.common import console
from tfcluster.config import Settings
from tfcluster.errors import ConfigError


def offers(settings: Settings) -> None:
    """Print one line per zone; nothing is created."""
    from tfcluster.backends.gcp.cloud import translated
    from tfcluster.backends.gcp.zones import find_offers, without_project

    if settings.backend == "vertex":  # Vertex AI's own training prices and quota, per region.
        from tfcluster.backends.vertex.preflight import offers as vertex_offers

        if not settings.project:
            raise ConfigError("offers --backend vertex needs --project (or tfcluster.project in invoke.yaml): the "
                              "regions offering the GPU and Vertex AI's training quota are the project's")
        with translated(settings.project, "offers"):
            lines = vertex_offers(settings)
        for line in lines:
            console.print(line, markup=False, highlight=False, soft_wrap=True)
        return
    if not settings.project:  # Choosing a GPU before there is a project: the dated table, marked as such.
        for line in without_project(settings.gpu, settings.gpu_count, settings.machine_type, settings.spot):
            console.print(line, markup=False, highlight=False, soft_wrap=True)
        return
    with translated(settings.project, "offers"):
        found = find_offers(settings.project, settings.gpu, settings.gpu_count, settings.machine_type, settings.spot)
    if not found.zones:
        raise ConfigError(f"no zone offers {found.gpu.accelerator} to project {settings.project}; see "
                          "https://cloud.google.com/compute/docs/gpus/gpu-regions-zones")
    for line in found.lines():
        console.print(line, markup=False, highlight=False, soft_wrap=True)
