"""The plugin-protocol servicer: `tf`'s, with whole-object plans and applies.

`tf` 1.2.0 decodes a state attribute by attribute through its own Attribute/NestedBlock classes,
which cannot express list-nested blocks, and its create plan leaves computed attributes inside
nested blocks null. This servicer keeps `tf`'s transport (go-plugin handshake, TLS, GetMetadata,
GetProviderSchema, validation) and handles the resource lifecycle on whole objects, completed
against the generated schema (schema.py). Terraform's protocol: developer.hashicorp.com/terraform/
plugin/terraform-plugin-protocol (tfplugin6.proto: PlanResourceChange, ApplyResourceChange, ...).
"""

from __future__ import annotations

import json
import sys
import traceback

from tf import provider as tf_provider
from tf.gen import tfplugin_pb2 as pb
from tf.utils import Diagnostics, _to_attribute_path, read_dynamic_value, to_dynamic_value

from tests.world.provider.schema import complete, keep_planned, mark_computed_unknown, resolve_unknown


class ProviderFailure(Exception):
    """A call the provider reports as terraform's own `Error:` block (summary, detail)."""

    def __init__(self, summary: str, detail: str = ""):
        super().__init__(summary)
        self.summary, self.detail = summary, detail


def _changed(block: dict, prior: dict, proposed: dict, paths) -> list:
    """The replace-forcing paths (top-level names, or (block, attribute) pairs) that change."""
    out = []
    for path in paths:
        if isinstance(path, str):
            if prior.get(path) != proposed.get(path):
                out.append([path])
            continue
        outer, inner = path
        before = [item.get(inner) for item in prior.get(outer) or []]
        after = [item.get(inner) for item in proposed.get(outer) or []]
        if before != after:
            out.append([outer, (0,), inner])
    return out


class Servicer(tf_provider.ProviderServicer):
    def _resource(self, type_name: str):
        klass = self._get_res_cls(type_name)
        return klass, self.app.new_resource(klass)

    def _guard(self, response, diags: Diagnostics, work):
        try:
            return work()
        except ProviderFailure as failure:
            diags.add_error(failure.summary, failure.detail)
        except Exception as error:  # noqa: BLE001 - a bug in the stand-in shows as terraform's error
            traceback.print_exc(file=sys.stderr)
            diags.add_error(f"provider stand-in crashed: {type(error).__name__}: {error}")
        return response(diagnostics=diags.to_pb())

    def UpgradeResourceState(self, request, context):
        state = json.loads(request.raw_state.json) if request.raw_state.json else None
        return pb.UpgradeResourceState.Response(upgraded_state=to_dynamic_value(state))

    def ReadResource(self, request, context):
        diags = Diagnostics()
        klass, resource = self._resource(request.type_name)
        current = read_dynamic_value(request.current_state)

        def work():
            state = resource.read(current)
            return pb.ReadResource.Response(new_state=to_dynamic_value(complete(klass.block(), state)),
                                            diagnostics=diags.to_pb())
        return self._guard(pb.ReadResource.Response, diags, work)

    def PlanResourceChange(self, request, context):
        diags = Diagnostics()
        klass, resource = self._resource(request.type_name)
        prior = read_dynamic_value(request.prior_state)
        proposed = read_dynamic_value(request.proposed_new_state)

        def work():
            if proposed is None:  # A destroy plan.
                return pb.PlanResourceChange.Response(planned_state=to_dynamic_value(None))
            if prior is None:
                planned = resource.plan_create(mark_computed_unknown(klass.block(), proposed))
                return pb.PlanResourceChange.Response(planned_state=to_dynamic_value(planned),
                                                      diagnostics=diags.to_pb())
            replace = _changed(klass.block(), prior, proposed, klass.forces_new)
            planned = resource.plan_update(prior, proposed, bool(replace))
            return pb.PlanResourceChange.Response(
                planned_state=to_dynamic_value(planned), diagnostics=diags.to_pb(),
                requires_replace=[_to_attribute_path(path) for path in replace])
        return self._guard(pb.PlanResourceChange.Response, diags, work)

    def ApplyResourceChange(self, request, context):
        diags = Diagnostics()
        klass, resource = self._resource(request.type_name)
        prior = read_dynamic_value(request.prior_state)
        planned = read_dynamic_value(request.planned_state)

        def work():
            if planned is None:
                resource.delete(prior)
                state = None
            elif prior is None:
                state = resource.create(resolve_unknown(planned))
            else:
                state = resource.update(prior, resolve_unknown(planned))
            state = complete(klass.block(), resolve_unknown(keep_planned(klass.block(), planned, state)))
            return pb.ApplyResourceChange.Response(new_state=to_dynamic_value(state), diagnostics=diags.to_pb())
        return self._guard(pb.ApplyResourceChange.Response, diags, work)

    def ImportResourceState(self, request, context):
        diags = Diagnostics()
        klass, resource = self._resource(request.type_name)

        def work():
            state = complete(klass.block(), resource.import_(request.id))
            return pb.ImportResourceState.Response(imported_resources=[pb.ImportResourceState.ImportedResource(
                type_name=request.type_name, state=to_dynamic_value(state))], diagnostics=diags.to_pb())
        return self._guard(pb.ImportResourceState.Response, diags, work)


def run(provider) -> None:
    """Serve ``provider`` to terraform (go-plugin handshake on stdout) with this servicer."""
    from tf import runner

    tf_provider.ProviderServicer = Servicer  # run_provider looks it up at call time.
    runner.run_provider(provider)
