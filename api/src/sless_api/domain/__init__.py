"""The platform's vocabulary, with no I/O: errors, records, routing types, the ports (the backend interfaces),
versions, the contract rules, the secrets model, the change feed and zip safety. Everything may import it; it
imports nothing of the API."""
