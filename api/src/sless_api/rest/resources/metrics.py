"""``GET /metrics``: the Prometheus exposition, for the scraper holding the operator's scrape token.

Not a tenant route: a tenant's token does not open it, and it shows every tenant's function names. It is
off (404) until ``SLESS_METRICS_TOKEN`` is set, then answers only ``Authorization: Bearer <that token>``
(compared in constant time), the way Prometheus' ``authorization`` scrape setting sends it.
"""

from __future__ import annotations

import falcon.asgi

from sless_api import metrics
from sless_api.rest.http import ApiError, PublicResource


class Metrics(PublicResource):
    """Public to the router (no tenant token), guarded by the scrape token instead."""

    def __init__(self, scrape_token: str) -> None:
        self.scrape_token = scrape_token

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        if not self.scrape_token:
            raise ApiError(404, "metrics are off: set SLESS_METRICS_TOKEN to serve them")
        if not metrics.scrape_allowed(req.get_header("Authorization"), self.scrape_token):
            resp.set_header("WWW-Authenticate", 'Bearer realm="sless-metrics"')
            raise ApiError(401, "a scrape needs the metrics token (Authorization: Bearer ...)")
        body, content_type = metrics.exposition()
        resp.content_type = content_type
        resp.data = body
