"""`invoke offers`: what exists for a GPU and what it costs. Without --gpu-count, every machine type
the GPU comes in, priced in each provisioning model with what each needs (tfcluster/backends/gcp/
offers.py every_shape); with it and a project, the zones that offer that VM, with the price of one VM
and the project's free quota in each region, cheapest first. `offers --backend vertex` answers the
same way: Vertex AI's price of one replica without a project, its regions and quota with one."""

from __future__ import annotations

from tfcluster.commands.common import console
from tfcluster.config import Settings
from tfcluster.errors import ConfigError


def _print(lines: list[str]) -> None:
    for line in lines:
        console.print(line, markup=False, highlight=False, soft_wrap=True)


def offers(settings: Settings, every_shape: bool = False) -> None:
    """Print the listing; nothing is created. ``every_shape``: no --gpu-count was given."""
    from tfcluster.backends.gcp.cloud import translated
    from tfcluster.backends.gcp.zones import every_shape as shapes, find_offers, without_project

    if settings.backend == "vertex":  # Vertex AI's own training prices and quota, per region.
        from tfcluster.backends.vertex.preflight import offers as vertex_offers

        if not settings.project:
            _print(vertex_without_project(settings))
            return
        with translated(settings.project, "offers"):
            _print(vertex_offers(settings))
        return
    if every_shape and not settings.project:  # Choosing a GPU before there is a project: the dated table.
        _print(shapes(settings.gpu))
        return
    if not settings.project:
        _print(without_project(settings.gpu, settings.gpu_count, settings.machine_type, settings.spot))
        return
    with translated(settings.project, "offers"):
        found = find_offers(settings.project, settings.gpu, settings.gpu_count, settings.machine_type, settings.spot)
    if not found.zones:
        raise ConfigError(f"no zone offers {found.gpu.accelerator} to project {settings.project}; see "
                          "https://cloud.google.com/compute/docs/gpus/gpu-regions-zones")
    lines = found.lines()
    others = [f"{name} ({shape.gpus} GPUs{', Spot or Flex-start only' if shape.spot_only else ''}): --gpu-count "
              f"{shape.gpus}" for name, shape in found.gpu.machine_types.items() if name != found.machine_type]
    if every_shape and others:
        lines.append(f"also {found.gpu.name} VMs: " + "; ".join(others))
    _print(lines)


def vertex_without_project(settings: Settings) -> list[str]:
    """One Vertex AI replica's price an hour from its dated table; regions and quota need a project."""
    from tfcluster.backends.vertex import money

    table = money.table()
    hour = {}
    for spot in (False, True):
        rates = money.replica_rates(settings.machine_type, settings.gpu, settings.gpu_count, spot)
        hour[spot] = rates["vm"] + rates["gpu"]
    return [f"{settings.gpu} on Vertex AI: one replica is {settings.machine_type} with {settings.gpu_count} GPU(s): "
            f"${hour[False]:.2f}/h on-demand, ${hour[True]:.2f}/h Spot",
            f"prices: Vertex AI training, {table['region']} list prices of {table['date']}; no project given, so no "
            "regions and no quota: `invoke offers --backend vertex --project P` lists the regions that offer it, "
            "with your training quota"]
