"""The embedded backend: SQLite state, local builds, supervised runtime processes, in-process cron."""
