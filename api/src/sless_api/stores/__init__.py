"""Where the platform keeps data: code archives, tenant secrets, the invocation log."""
