"""The daemon's HTTP layer: the app and its middlewares (app.py), the one table of
routes (routes.py) and their handlers, request parsing (inputs.py), the browser guards
(exposure.py), the OpenAPI document and the dashboard."""
