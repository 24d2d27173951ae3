package pgtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"
)

// envRequireFaketime, set to 1 (CI), makes RequireSkewedServer (and the
// runtime's skewed-clock tests) fail instead of skip when libfaketime is
// missing.
const envRequireFaketime = "HARNESS_REQUIRE_FAKETIME"

// ErrNoFaketime marks a machine without libfaketime (Debian: apt-get
// install faketime), which a process's skewed clock needs: a server started
// with Options.ClockOffset, a runtime process of internal/realfaults.
var ErrNoFaketime = errors.New("libfaketime is not installed (Debian: apt-get install faketime)")

// faketimeLibraries are where Debian puts libfaketime's multi-threaded
// variant (the runtime is multi-threaded; a server's backends are
// processes, and take it as well).
func faketimeLibraries() []string {
	return []string{
		"/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1",
		"/usr/lib/aarch64-linux-gnu/faketime/libfaketimeMT.so.1",
		"/usr/lib/faketime/libfaketimeMT.so.1",
	}
}

// FaketimeEnv is the environment that sets a process's clock offset from
// the real one, in whole seconds (nil for none): libfaketime preloaded, the
// monotonic clock left alone so that timeouts and sleeps keep their
// length. It fails with ErrNoFaketime when libfaketime is not installed.
func FaketimeEnv(offset time.Duration) ([]string, error) {
	if offset == 0 {
		return nil, nil
	}
	if offset%time.Second != 0 {
		return nil, fmt.Errorf("a clock offset is a whole number of seconds (libfaketime's FAKETIME), got %s", offset)
	}
	for _, lib := range faketimeLibraries() {
		if _, err := os.Stat(lib); err == nil {
			return []string{
				"LD_PRELOAD=" + lib,
				fmt.Sprintf("FAKETIME=%+ds", int64(offset/time.Second)),
				"FAKETIME_DONT_FAKE_MONOTONIC=1",
			}, nil
		}
	}
	return nil, ErrNoFaketime
}

// RequireSkewedServer starts a throwaway server of the test's own whose
// clock runs offset from the real one (Options.ClockOffset; positive:
// ahead of its callers), from the environment's settings (OptionsFromEnv),
// and closes it when the test ends. It skips, saying why, where it cannot:
// the environment names an existing server (HARNESS_DSN) or Docker, no
// local binaries, or no libfaketime (unless $HARNESS_REQUIRE_FAKETIME is
// 1: then that is a failure).
func RequireSkewedServer(t testing.TB, offset time.Duration) *Server {
	t.Helper()
	opts := OptionsFromEnv()
	if opts.Backend == DSN || opts.Backend == Docker || (opts.Backend != Local && opts.DSN != "") {
		t.Skipf("a server whose clock is %s off is one this test starts with the local backend; the environment names %s", offset, namedBackend(opts))
	}
	opts.Backend, opts.DSN, opts.ClockOffset = Local, "", offset
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv, err := Start(ctx, opts)
	switch {
	case errors.Is(err, ErrNoFaketime) && os.Getenv(envRequireFaketime) != "1":
		t.Skipf("a server whose clock is %s off: %v (set %s=1 to make this a failure)", offset, err, envRequireFaketime)
	case errors.Is(err, ErrUnavailable):
		t.Skipf("the local backend cannot run here: %v", err)
	case err != nil:
		t.Fatalf("start a server whose clock is %s off: %v", offset, err)
	}
	t.Cleanup(func() { _ = srv.Close(context.Background()) })
	return srv
}

// namedBackend names the backend the environment asks for.
func namedBackend(opts Options) string {
	if opts.Backend == DSN || (opts.Backend != Docker && opts.DSN != "") {
		return "an existing server (HARNESS_DSN)"
	}
	return string(opts.Backend)
}
