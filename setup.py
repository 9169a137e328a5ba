"""The server's packages, with the client bundled from its own project under client/.

Metadata and dependencies are in setup.cfg. The client (``ibex_client``) is a distribution of
its own (``pip install ./client``, httpx only); the server imports it, and a relative path is
not a requirement pip accepts, so the server's distribution carries the same package from the
same folder: ``pip install -e .`` on a fresh clone has everything the server imports.
"""

from setuptools import find_packages, setup

SERVER_PACKAGES = (
    "cli",
    "core",
    "embeddings",
    "models",
    "schema",
    "actors",
    "extraction",
    "memory_service",
    "proxy",
    "mcp_server",
)

setup(
    packages=[
        *find_packages(include=[*SERVER_PACKAGES, *(f"{name}.*" for name in SERVER_PACKAGES)]),
        "migrations",
        "examples",
        "ibex_client",
    ],
    package_dir={"ibex_client": "client/ibex_client"},
)
