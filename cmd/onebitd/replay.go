package main

import (
	"fmt"
	"os"
)

// replayMain is replaced by the real command as it lands.
func replayMain(args []string) int {
	fmt.Fprintln(os.Stderr, "onebitd: replay is not built in this revision")
	return 2
}
