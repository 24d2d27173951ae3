package lab

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/duroxide-pg/migrations/internal/testenv/pgtest"
)

// run runs `harness-lab ARGS...` in-process.
func run(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = Run(context.Background(), args, &out, &errOut)
	return code, out.String(), errOut.String()
}

func startServer(t *testing.T) *pgtest.Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srv, err := pgtest.Start(ctx, pgtest.OptionsFromEnv())
	if errors.Is(err, pgtest.ErrUnavailable) {
		t.Skipf("no PostgreSQL here: %v", err)
	}
	require.NoError(t, err)
	t.Cleanup(func() { _ = srv.Close(context.Background()) })
	return srv
}
