// Command harness is the operator command: migrate, baseline, sql, doctor
// and version, against the database it is given. Run `harness help` for
// the commands. It links no test code and no throwaway-server backend; the
// repros, benches, soaks and throwaway databases are harness-lab's.
package main

import (
	"context"
	"os"

	"github.com/duroxide-pg/migrations/internal/cli"
)

func main() {
	os.Exit(cli.Run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}
