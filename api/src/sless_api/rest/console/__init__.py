"""The web console: a static page that talks to the same authenticated REST API as every other client."""
