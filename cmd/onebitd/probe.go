package main

import (
	"fmt"
	"os"
)

// probeMain is replaced by the real command as it lands.
func probeMain(args []string) int {
	fmt.Fprintln(os.Stderr, "onebitd: probe is not built in this revision")
	return 2
}
