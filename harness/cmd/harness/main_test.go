package main

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// TestTheOperatorCommandLinksNoTestCode: the command a DBA runs against
// production links neither the testing package nor the throwaway-server
// backends (dockertest, the local server, the real runtime's driver); the
// lab command, harness-lab, has those.
func TestTheOperatorCommandLinksNoTestCode(t *testing.T) {
	goCmd := filepath.Join(runtime.GOROOT(), "bin", "go")
	out, err := exec.Command(goCmd, "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps .: %v\n%s", err, out)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 50 {
		t.Fatalf("go list -deps listed %d packages; expected the command's whole graph:\n%s", len(deps), out)
	}
	for _, dep := range deps {
		switch {
		case dep == "testing",
			strings.HasPrefix(dep, "testing/"),
			strings.Contains(dep, "dockertest"),
			strings.Contains(dep, "/internal/testenv"),
			strings.Contains(dep, "/internal/sim"),
			strings.Contains(dep, "/internal/cli/lab"):
			t.Errorf("the operator command links %s", dep)
		}
	}
}
