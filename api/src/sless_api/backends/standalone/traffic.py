"""Traffic splits of the standalone backend: the split's other version built and run beside the current one.

Setting a split checks it against the kept versions (``sless_core.traffic.check_versions``), makes sure the
other version's code is on disk (it comes back from the code store if it was pruned), builds it (the
dependency cache and Go binaries are keyed by hash, so a version built before is found again) and stores
the split with that artifact; the router then runs both processes and shares calls by weight. The split
lives in the state database, so it survives a restart. A deploy (upload, update, rollback) drops it
(``Functions``), as does deleting the function.
"""

from __future__ import annotations

import asyncio

from sless_api.backends.standalone.builder import Builder, BuildFailed, BuildRequest
from sless_api.backends.standalone.code import CodeFiles
from sless_api.backends.standalone.routing import StandaloneRouter
from sless_api.backends.standalone.state import StateStore, artifact_to_dict, require_function
from sless_api.domain.errors import Conflict
from sless_core.models import Phase
from sless_core.traffic import TrafficSplit, check_versions


class Traffic:
    def __init__(self, state: StateStore, router: StandaloneRouter, code: CodeFiles, builder: Builder) -> None:
        self.state = state
        self.router = router
        self.code = code
        self.builder = builder

    async def get_traffic(self, namespace: str, name: str) -> TrafficSplit | None:
        require_function(self.state, namespace, name)
        found = self.state.get_traffic(namespace, name)
        return found[0] if found is not None else None

    async def set_traffic(self, namespace: str, name: str, split: TrafficSplit) -> TrafficSplit:
        rec = require_function(self.state, namespace, name)
        history = self.state.list_versions(namespace, name)
        current = check_versions(split, [v.version for v in history], name)
        if rec.phase != Phase.READY:
            raise Conflict(f"function {name!r} is {rec.phase}: a split can be set while it is Ready")
        other = split.other_than(current)
        artifact = None
        if other is not None:
            version = next(v for v in history if v.version == other.version)
            await asyncio.to_thread(self.code.ensure_unpacked, namespace, name, version)
            request = BuildRequest(runtime=str(version.config["runtime"]),
                                   code_dir=self.code.code_dir(namespace, name, version.code_hash),
                                   entrypoint=str(version.config["entrypoint"]), code_hash=version.code_hash,
                                   tenant=namespace)
            try:
                artifact = artifact_to_dict(await asyncio.to_thread(self.builder.build, request, None))
            except BuildFailed as exc:
                raise Conflict(f"version {other.version} of function {name!r} does not build again: "
                               f"{exc.log_tail[-500:]}") from None
        self.state.set_traffic(namespace, name, split, artifact)
        await self.router.sync(namespace, name)
        return split

    async def clear_traffic(self, namespace: str, name: str) -> bool:
        require_function(self.state, namespace, name)
        cleared = self.state.clear_traffic(namespace, name)
        if cleared:
            await self.router.sync(namespace, name)
        return cleared
