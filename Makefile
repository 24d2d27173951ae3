# duroxide-pg-migrations. `make help` lists the targets.
GO      ?= go
HARNESS := $(GO) run ./harness/cmd/harness
DSN     ?=
SCHEMA  ?= duroxide
OUT     ?= out

.PHONY: help test repro lint up db build

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-8s %s\n", $$1, $$2}'

test: ## run every test on a throwaway PostgreSQL (default backend: local binaries)
	$(GO) test -count=1 -timeout 20m ./...

repro: ## show the bug at 0019 and the fix at 0020 on a throwaway PostgreSQL
	@mkdir -p $(OUT)
	$(HARNESS) repro all --report $(OUT) --json $(OUT)/repro.json

lint: ## gofmt and go vet
	@unformatted=$$(gofmt -l $$(git ls-files '*.go')); \
	if [ -n "$$unformatted" ]; then echo "gofmt would change: $$unformatted"; exit 1; fi
	$(GO) vet ./...

up: ## apply every migration: make up DSN=postgres://... [SCHEMA=duroxide]
	@test -n "$(DSN)" || { echo "usage: make up DSN=postgres://user@host:5432/db [SCHEMA=duroxide]"; exit 2; }
	$(HARNESS) migrate up --dsn '$(DSN)' --schema '$(SCHEMA)'

db: ## start a throwaway PostgreSQL, print its DSN, keep it until Ctrl-C
	$(HARNESS) db start

build: ## build bin/harness
	$(GO) build -o bin/harness ./harness/cmd/harness
