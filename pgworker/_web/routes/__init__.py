"""The HTTP API's routes, one router per resource (jobs, the workers' side of a job, bulk actions,
events, queues, workers, stats, periodic schedules, health): each route takes what it needs
through FastAPI dependencies (common.Served), and api.install includes them all."""
