package lab

import (
	"bytes"
	"context"
	"testing"

	"github.com/duroxide-pg/migrations/internal/testenv/pgtest"
)

// run runs `harness-lab ARGS...` in-process.
func run(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = Run(context.Background(), args, &out, &errOut)
	return code, out.String(), errOut.String()
}

func startServer(t *testing.T) *pgtest.Server { return pgtest.RequireServer(t) }
