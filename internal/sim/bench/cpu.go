package bench

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/duroxide-pg/migrations/internal/dbconn"
)

// clockTicks is the kernel's USER_HZ, the unit of the CPU times in
// /proc/<pid>/stat: 100 on every Linux architecture Go supports (it is part
// of the ABI); reading it with sysconf would need cgo.
const clockTicks = 100

// serverCPU reads the CPU time of a PostgreSQL server running on this
// machine from /proc: the postmaster's own time and that of the children it
// has reaped (utime+stime+cutime+cstime), plus the time of its live
// children (backends, background workers). The difference of two readings
// is what the server used in between, whichever backends came and went.
type serverCPU struct {
	postmaster int
}

// newServerCPU finds the postmaster of the server behind src through a
// backend's parent; nil, with the reason, when the server's processes are
// not visible here (another host, a container, another pid namespace).
func newServerCPU(ctx context.Context, src *dbconn.Source) (*serverCPU, string) {
	conn, err := src.Connect(ctx)
	if err != nil {
		return nil, "n/a (" + err.Error() + ")"
	}
	defer conn.Close(context.Background())
	var pid int
	if err := conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		return nil, "n/a (" + err.Error() + ")"
	}
	st, err := readStat(pid)
	if err != nil || !isPostgres(pid) || !isPostgres(st.ppid) {
		return nil, "n/a (the server's processes are not visible in this machine's /proc)"
	}
	c := &serverCPU{postmaster: st.ppid}
	if _, _, err := c.read(); err != nil {
		return nil, "n/a (" + err.Error() + ")"
	}
	return c, fmt.Sprintf("/proc: postmaster pid %d and its children, utime+stime", st.ppid)
}

func isPostgres(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	return err == nil && strings.HasPrefix(strings.TrimSpace(string(b)), "postgres")
}

type procStat struct {
	ppid                         int
	utime, stime, cutime, cstime int64
}

func readStat(pid int) (procStat, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return procStat{}, err
	}
	return parseStat(string(b))
}

// parseStat parses /proc/<pid>/stat; the command name (field 2) may hold
// spaces and parentheses, so fields are counted from the last ')'.
func parseStat(s string) (procStat, error) {
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return procStat{}, fmt.Errorf("unparsable /proc stat %q", s)
	}
	f := strings.Fields(s[i+1:])
	// f[0] is field 3 (state): field k is f[k-3].
	if len(f) < 15 {
		return procStat{}, fmt.Errorf("short /proc stat %q", s)
	}
	var st procStat
	var errs [5]error
	st.ppid, errs[0] = strconv.Atoi(f[1])
	st.utime, errs[1] = strconv.ParseInt(f[11], 10, 64)
	st.stime, errs[2] = strconv.ParseInt(f[12], 10, 64)
	st.cutime, errs[3] = strconv.ParseInt(f[13], 10, 64)
	st.cstime, errs[4] = strconv.ParseInt(f[14], 10, 64)
	for _, err := range errs {
		if err != nil {
			return procStat{}, fmt.Errorf("unparsable /proc stat %q: %w", s, err)
		}
	}
	return st, nil
}

// read returns the server's CPU seconds so far and its live children.
func (c *serverCPU) read() (float64, int, error) {
	pm, err := readStat(c.postmaster)
	if err != nil {
		return 0, 0, fmt.Errorf("postmaster %d: %w", c.postmaster, err)
	}
	ticks := pm.utime + pm.stime + pm.cutime + pm.cstime
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, 0, err
	}
	children := 0
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, err := readStat(pid)
		if err != nil || st.ppid != c.postmaster {
			continue
		}
		children++
		ticks += st.utime + st.stime
	}
	return float64(ticks) / clockTicks, children, nil
}

// cpuWindow measures one run: start before it, stop after it.
type cpuWindow struct {
	c        *serverCPU
	start    float64
	children int
	ok       bool
}

func (c *serverCPU) begin() cpuWindow {
	if c == nil {
		return cpuWindow{}
	}
	s, n, err := c.read()
	return cpuWindow{c: c, start: s, children: n, ok: err == nil}
}

// end returns the CPU seconds since begin, -1 when unknown. It first waits
// (up to 1 s) for the run's backends to exit and be reaped, so that their
// time has moved into the postmaster's cutime+cstime.
func (w cpuWindow) end() float64 {
	if !w.ok {
		return -1
	}
	deadline := time.Now().Add(time.Second)
	for {
		s, n, err := w.c.read()
		if err != nil {
			return -1
		}
		if n <= w.children || time.Now().After(deadline) {
			return max(s-w.start, 0)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
