package pgtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// tempPrefix names the directories the local backend creates under the
// system temp dir; sweepStale removes leftovers whose server is gone.
const tempPrefix = "harness-pg-"

// localServer is a postmaster this process started in a temp directory.
type localServer struct {
	dir  string // temp dir holding data/ and the socket
	bin  string
	port int
	cred *syscall.Credential // non-nil when we dropped root privileges
	cmd  *exec.Cmd
	done chan error // receives the postmaster's exit
	logs *bytes.Buffer
	cfg  *pgx.ConnConfig
	// preload is the shared_preload_libraries setting ("" for none).
	preload string
	// settings are Options.Settings, passed as -c after the defaults.
	settings []string
	// env is the postmaster's extra environment: libfaketime's, for
	// Options.ClockOffset (nil for none).
	env []string
}

// findBinaries returns the directory holding initdb, pg_ctl and postgres:
// pgBin when set, else the one on PATH, else the newest
// /usr/lib/postgresql/*/bin.
func findBinaries(pgBin string) (string, error) {
	need := []string{"initdb", "pg_ctl", "postgres"}
	has := func(dir string) bool {
		for _, n := range need {
			if st, err := os.Stat(filepath.Join(dir, n)); err != nil || st.IsDir() {
				return false
			}
		}
		return true
	}
	if pgBin != "" {
		if has(pgBin) {
			return pgBin, nil
		}
		return "", fmt.Errorf("PG_BIN=%s does not hold initdb, pg_ctl and postgres", pgBin)
	}
	if p, err := exec.LookPath("initdb"); err == nil && has(filepath.Dir(p)) {
		return filepath.Dir(p), nil
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return pgMajor(dirs[i]) > pgMajor(dirs[j]) })
	for _, d := range dirs {
		if has(d) {
			return d, nil
		}
	}
	return "", fmt.Errorf("%w: no initdb/pg_ctl/postgres in PG_BIN, PATH or /usr/lib/postgresql/*/bin", ErrUnavailable)
}

func pgMajor(binDir string) float64 {
	v, _ := strconv.ParseFloat(filepath.Base(filepath.Dir(binDir)), 64)
	return v
}

// unprivileged picks the account the server runs as when we are root:
// postgres when it exists, else nobody.
func unprivileged() (*syscall.Credential, error) {
	for _, name := range []string{"postgres", "nobody"} {
		u, err := user.Lookup(name)
		if err != nil {
			continue
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
	}
	return nil, errors.New("running as root and neither user postgres nor nobody exists to run the server")
}

func startLocal(ctx context.Context, opts Options) (*localServer, error) {
	bin, err := findBinaries(opts.PGBin)
	if err != nil {
		return nil, err
	}
	env, err := FaketimeEnv(opts.ClockOffset)
	if err != nil {
		return nil, err
	}
	sweepStale(opts.Logf)
	s := &localServer{bin: bin, logs: &bytes.Buffer{}, done: make(chan error, 1), preload: shippedLibraries(bin, opts.Preload), settings: opts.Settings, env: env}
	if os.Geteuid() == 0 {
		if s.cred, err = unprivileged(); err != nil {
			return nil, err
		}
	}
	if s.dir, err = os.MkdirTemp("", tempPrefix); err != nil {
		return nil, fmt.Errorf("temp dir: %w", err)
	}
	if err := writeOwner(s.dir); err != nil {
		_ = os.RemoveAll(s.dir)
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			_ = s.close(context.Background())
		}
	}()
	if s.cred != nil {
		if err := os.Chown(s.dir, int(s.cred.Uid), int(s.cred.Gid)); err != nil {
			return nil, fmt.Errorf("give %s to the server's user: %w", s.dir, err)
		}
	}
	opts.Logf("pgtest: initdb in %s (%s)", s.dir, bin)
	initdb := s.command(ctx, "initdb", "-D", s.dataDir(), "-U", "postgres", "-A", "trust",
		"-E", "UTF8", "--locale=C", "--no-sync", "--no-instructions")
	if out, err := initdb.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("initdb: %w\n%s", err, out)
	}
	if err := s.start(ctx); err != nil {
		return nil, err
	}
	ok = true
	return s, nil
}

func (s *localServer) dataDir() string { return filepath.Join(s.dir, "data") }

func (s *localServer) command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, filepath.Join(s.bin, name), args...)
	cmd.Dir = s.dir
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
	return cmd
}

// start launches the postmaster on a free port and waits until it accepts
// connections.
func (s *localServer) start(ctx context.Context) error {
	if s.port == 0 {
		port, err := freePort()
		if err != nil {
			return err
		}
		s.port = port
	}
	port := s.port
	s.logs.Reset()
	s.done = make(chan error, 1)
	// Not CommandContext: the server must outlive the start-up context.
	args := []string{"-D", s.dataDir(), "-p", strconv.Itoa(port), "-k", s.dir,
		"-c", "listen_addresses=127.0.0.1",
		"-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
		"-c", "max_connections=300", "-c", "shared_buffers=128MB",
		"-c", "max_locks_per_transaction=256"}
	if s.preload != "" {
		args = append(args, "-c", "shared_preload_libraries="+s.preload)
	}
	for _, setting := range s.settings {
		args = append(args, "-c", setting)
	}
	cmd := exec.Command(filepath.Join(s.bin, "postgres"), args...)
	cmd.Dir = s.dir
	cmd.Env = append(append(os.Environ(), "LC_ALL=C"), s.env...)
	cmd.Stdout = s.logs
	cmd.Stderr = s.logs
	// The server dies with us even when this process panics or is killed:
	// SIGQUIT is PostgreSQL's immediate shutdown.
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred, Pdeathsig: syscall.SIGQUIT, Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start postgres: %w", err)
	}
	s.cmd = cmd
	go func() { s.done <- cmd.Wait() }()

	cfg, err := pgx.ParseConfig(fmt.Sprintf("host=127.0.0.1 port=%d user=postgres dbname=postgres sslmode=disable connect_timeout=5", port))
	if err != nil {
		return err
	}
	s.cfg = cfg
	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case err := <-s.done:
			s.done <- err
			return fmt.Errorf("postgres exited during start-up: %v\n%s", err, s.logs.String())
		default:
		}
		conn, err := pgx.ConnectConfig(ctx, cfg)
		if err == nil {
			conn.Close(ctx)
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("postgres did not accept connections: %v\n%s", err, s.logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// stop asks for a fast shutdown and waits for it, killing the server when it
// takes longer than ten seconds.
func (s *localServer) stop() error {
	if s.cmd == nil || s.cmd.Process == nil {
		return nil
	}
	defer func() { s.cmd = nil }()
	_ = s.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-s.done:
		return nil
	case <-time.After(10 * time.Second):
		_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
		<-s.done
		return errors.New("postgres did not stop in 10s and was killed")
	}
}

// Restart performs a fast shutdown and starts the server again on the same
// data directory and port.
func (s *localServer) restart(ctx context.Context) error {
	if err := s.stop(); err != nil {
		return err
	}
	return s.start(ctx)
}

func (s *localServer) adminConfig() *pgx.ConnConfig { return s.cfg }

func (s *localServer) close(context.Context) error {
	err := s.stop()
	if s.dir != "" {
		if rmErr := os.RemoveAll(s.dir); rmErr != nil {
			err = errors.Join(err, fmt.Errorf("remove %s: %w", s.dir, rmErr))
		}
	}
	return err
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// ownerFile, in each directory the local backend creates, holds the
// process id of the process that created it: a sweep leaves the directory
// of a live process alone, even while its server is stopped (a restart).
const ownerFile = "owner.pid"

// writeOwner records this process as the owner of dir.
func writeOwner(dir string) error {
	if err := os.WriteFile(filepath.Join(dir, ownerFile), []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644); err != nil {
		return fmt.Errorf("record the owner of %s: %w", dir, err)
	}
	return nil
}

// sweepStale removes temp directories of local servers whose owner and
// postmaster are no longer running (left behind by a process that was
// killed before it could clean up).
func sweepStale(logf func(string, ...any)) {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), tempPrefix+"*"))
	for _, d := range dirs {
		st, err := os.Stat(d)
		if err != nil || time.Since(st.ModTime()) < time.Minute {
			continue // too young: may still be initialising
		}
		if pid := postmasterPID(filepath.Join(d, ownerFile)); pid > 0 && syscall.Kill(pid, 0) == nil {
			continue // its owner is alive: its server may be restarting
		}
		if pid := postmasterPID(filepath.Join(d, "data", "postmaster.pid")); pid > 0 && syscall.Kill(pid, 0) == nil {
			continue
		}
		if pid := postmasterPID(filepath.Join(d, bouncerPIDFile)); pid > 0 && syscall.Kill(pid, 0) == nil {
			continue // a running pgbouncer's directory
		}
		if logf != nil {
			logf("pgtest: removing stale %s", d)
		}
		_ = os.RemoveAll(d)
	}
}

func postmasterPID(file string) int {
	b, err := os.ReadFile(file)
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	pid, _ := strconv.Atoi(strings.TrimSpace(line))
	return pid
}

// shippedLibraries is the shared_preload_libraries value of the libraries
// in want that the server of bin ships: bin/../lib/<name>.so (Debian's
// layout) or bin/../lib/postgresql/<name>.so (the npm binaries').
func shippedLibraries(bin string, want []string) string {
	// bin may hold links to the real binaries (/usr/local/bin ->
	// /usr/lib/postgresql/15/bin): the libraries sit next to those.
	if real, err := filepath.EvalSymlinks(filepath.Join(bin, "postgres")); err == nil {
		bin = filepath.Dir(real)
	}
	var have []string
	for _, name := range want {
		for _, dir := range []string{filepath.Join(bin, "..", "lib"), filepath.Join(bin, "..", "lib", "postgresql")} {
			if _, err := os.Stat(filepath.Join(dir, name+".so")); err == nil {
				have = append(have, name)
				break
			}
		}
	}
	return strings.Join(have, ",")
}
