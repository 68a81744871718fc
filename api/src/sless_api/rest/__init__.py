"""The REST API: falcon resources, the OpenAPI document, the console, and the mapping of errors to JSON."""
