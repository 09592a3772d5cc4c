package main

import (
	"fmt"
	"os"
)

// watchMain is replaced by the real command as it lands.
func watchMain(args []string) int {
	fmt.Fprintln(os.Stderr, "onebitd: watch is not built in this revision")
	return 2
}
