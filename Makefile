.PHONY: help install test unit integration lint format typecheck migrate up

help:  ## list the targets
	@grep -E '^[a-z-]+:.*##' Makefile | sed 's/:.*## /\t/'

install:  ## install the package with its test extra
	python3 -m pip install -e '.[test]'

test:  ## the whole test suite (it starts the Postgres and Redis it needs)
	python3 -m pytest

unit:  ## unit tests only (no sockets)
	python3 -m pytest tests/unit

integration:  ## integration tests (real Postgres and Redis, started by the suite)
	python3 -m pytest tests/integration

lint:  ## ruff and import-linter
	ruff check . && ruff format --check . && lint-imports

format:  ## format the code
	ruff format . && ruff check --fix .

typecheck:  ## mypy
	mypy core embeddings models schema extraction memory_service actors cli client/ibex_client

migrate:  ## apply the migrations to DATABASE_URL
	ibex migrate

up:  ## web, worker and scheduler on this machine until Ctrl-C (embedded servers)
	ibex up
