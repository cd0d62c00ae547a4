"""Every HTTP route of a node, in one table: method, path, handler. Each handler is a
module-level function of api/, so it can be imported and tested alone; what it needs
of the node it finds on the app (api/keys.py)."""
from __future__ import annotations

from typing import Awaitable, Callable

from aiohttp import web

from schedulerd.api import (backfill, bulk, calendars, cluster, dashboard, jobs, nodes, occurrences, preview, queues,
                            tasks)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

ROUTES: list[tuple[str, str, Handler]] = [
    ("POST", "/v1/jobs", jobs.create),
    ("POST", "/v1/jobs:batch", jobs.create_batch),
    ("POST", "/v1/jobs:pause", bulk.pause),
    ("POST", "/v1/jobs:resume", bulk.resume),
    ("POST", "/v1/jobs:cancel", bulk.cancel),
    ("GET", "/v1/jobs", jobs.list_jobs),
    ("GET", "/v1/jobs/{job_id}", jobs.get),
    ("DELETE", "/v1/jobs/{job_id}", jobs.cancel),
    ("PATCH", "/v1/jobs/{job_id}", jobs.update),
    ("POST", "/v1/jobs/{job_id}/pause", jobs.pause),
    ("POST", "/v1/jobs/{job_id}/resume", jobs.resume),
    ("POST", "/v1/jobs/{job_id}/trigger", jobs.trigger),
    ("POST", "/v1/jobs/{job_id}/backfill", backfill.backfill),
    ("GET", "/v1/jobs/{job_id}/runs", jobs.job_runs),
    ("GET", "/v1/jobs/{job_id}/preview", preview.job_preview),
    ("GET", "/v1/jobs/{job_id}/occurrences/{time}", occurrences.explain_occurrence),
    ("GET", "/v1/runs", jobs.list_runs),
    ("GET", "/v1/runs/{run_id}", jobs.get_run),
    ("DELETE", "/v1/runs/{run_id}", jobs.discard),
    ("POST", "/v1/runs/{run_id}/retry", jobs.redrive),
    ("POST", "/v1/runs/{run_id}/cancel", jobs.cancel_run),
    ("GET", "/v1/dead-letter", jobs.dead_letter_list),
    ("POST", "/v1/tasks/poll", tasks.poll),
    ("POST", "/v1/tasks/heartbeat", tasks.heartbeat_batch),
    ("POST", "/v1/tasks/ack", tasks.ack_batch),
    ("POST", "/v1/tasks/{run_id}/heartbeat", tasks.heartbeat_one),
    ("POST", "/v1/tasks/{run_id}/ack", tasks.ack_one),
    ("POST", "/v1/tasks/{run_id}/nack", tasks.nack),
    ("GET", "/v1/preview", preview.preview),
    ("GET", "/v1/cluster", cluster.cluster),
    ("GET", "/v1/cluster/digest", cluster.digest),
    ("POST", "/v1/cluster/nodes", nodes.register),
    ("GET", "/v1/cluster/nodes/{node_id}", nodes.standing),
    ("DELETE", "/v1/cluster/nodes/{node_id}", nodes.remove),
    ("GET", "/v1/queues", queues.list_queues),
    ("GET", "/v1/queues:history", queues.history),
    ("GET", "/v1/queues/{name}", queues.get),
    ("PUT", "/v1/queues/{name}", queues.put),
    ("GET", "/v1/calendars", calendars.list_calendars),
    ("GET", "/v1/calendars/{name}", calendars.get),
    ("PUT", "/v1/calendars/{name}", calendars.put),
    ("DELETE", "/v1/calendars/{name}", calendars.delete),
    ("GET", "/v1/audit", cluster.audit_log),
    ("GET", "/v1/openapi.json", cluster.openapi_document),
    ("GET", "/healthz", cluster.healthz),
    ("GET", "/readyz", cluster.readyz),
    ("GET", "/metrics", cluster.metrics),
    ("GET", "/ui", dashboard.page),
]
