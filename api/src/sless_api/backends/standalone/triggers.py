"""Triggers of the standalone backend: create, change, delete.

An http trigger changes the function's route (routing.py); any change is announced to the listeners
(cron, the event dispatcher), which read the triggers again. How triggers fire is firing.py.
"""

from __future__ import annotations

from typing import Any

from sless_api.backends.settings import PlatformSettings
from sless_api.backends.standalone import limits
from sless_api.backends.standalone.routing import StandaloneRouter
from sless_api.backends.standalone.state import StateStore, require_function
from sless_api.domain.contract import check_queue_free
from sless_api.domain.errors import Conflict, NotFound, Unsupported
from sless_api.domain.records import TriggerRecord
from sless_core.models import TriggerSpec, TriggerType


class Triggers:
    def __init__(self, config: PlatformSettings, state: StateStore, router: StandaloneRouter) -> None:
        self.config = config
        self.state = state
        self.router = router

    def _trigger(self, namespace: str, name: str) -> TriggerRecord:
        rec = self.state.get_trigger(namespace, name)
        if rec is None:
            raise NotFound(f"trigger {name!r} not found")
        return rec

    async def list_triggers(self, namespace: str) -> list[TriggerRecord]:
        return self.state.list_triggers(namespace)

    async def get_trigger(self, namespace: str, name: str) -> TriggerRecord:
        return self._trigger(namespace, name)

    def _check_trigger(self, namespace: str, spec: TriggerSpec) -> None:
        if spec.type == TriggerType.EVENT:
            if not self.config.rabbitmq_url:
                raise Unsupported("event triggers need RabbitMQ: set SLESS_RABBITMQ_URL (not supported by this "
                                  "installation yet)")
            check_queue_free(spec, self.state.list_triggers(namespace))
        require_function(self.state, namespace, spec.function)

    async def create_trigger(self, namespace: str, spec: TriggerSpec) -> TriggerRecord:
        self._check_trigger(namespace, spec)
        rec = TriggerRecord(namespace=namespace, spec=spec)
        if not limits.insert_within("triggers", f"trigger {spec.name!r}", self.config.tenant_limits.triggers,
                                    lambda limit: self.state.insert_trigger(rec, limit)):
            raise Conflict(f"trigger {spec.name!r} already exists",
                           existing=self._trigger(namespace, spec.name).to_api())
        await self._trigger_changed(namespace, spec.function)
        return rec

    async def patch_trigger(self, namespace: str, name: str, patch: dict[str, Any]) -> TriggerRecord:
        rec = self._trigger(namespace, name)
        old_function = rec.spec.function
        rec.spec = rec.spec.patched(patch)
        self._check_trigger(namespace, rec.spec)
        self.state.save_trigger(rec)
        await self._trigger_changed(namespace, rec.spec.function)
        if old_function != rec.spec.function:
            await self._trigger_changed(namespace, old_function)
        return rec

    async def delete_trigger(self, namespace: str, name: str) -> None:
        rec = self._trigger(namespace, name)
        self.state.delete_trigger(namespace, name)
        await self._trigger_changed(namespace, rec.spec.function)

    async def _trigger_changed(self, namespace: str, function: str) -> None:
        await self.router.sync(namespace, function)
        self.router.changed()
