// Command harness runs the pack's migrations, throwaway databases and
// repros. Run `harness help` for the commands.
package main

import (
	"context"
	"os"

	"github.com/duroxide-pg/migrations/internal/cli"
)

func main() {
	os.Exit(cli.Run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}
