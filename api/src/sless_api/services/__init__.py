"""Background services that run beside the API, for both backends: cron, event dispatch, async calls."""
