// Command harness-lab is the pack's laboratory: throwaway databases, the
// repros, the benches and the soaks. Run `harness-lab help` for the
// commands. The operator command, harness, has migrate, baseline, sql and
// doctor, and links none of this.
package main

import (
	"context"
	"os"

	"github.com/duroxide-pg/migrations/internal/cli/lab"
)

func main() {
	os.Exit(lab.Run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}
