"""Peer servers the runtime benchmark compares the sless runtimes with (see bench/README.md).

- ``raw_asyncio.py``, ``raw_threaded.py``: the Python ceilings (standard library only);
- ``raw_node.js``, ``raw_go.go``: the Node and Go ceilings (bare ``http.createServer``, bare ``net/http``);
- ``flask_app.py``: Flask the way Fission (bjoern) and OpenFaaS (waitress) serve Python functions, run by
  the interpreter of the peer virtualenv that ``venv.py`` creates outside the repository.
"""
