package main

import (
	"fmt"
	"os"
)

// serveMain is replaced by the real command as it lands.
func serveMain(args []string) int {
	fmt.Fprintln(os.Stderr, "onebitd: serve is not built in this revision")
	return 2
}
