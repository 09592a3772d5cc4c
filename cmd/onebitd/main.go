// Command onebitd serves completions through llama-server with an external
// KV prefill handoff. Subcommands: serve, watch, dashboard, replay, probe-decoder.
package main

import (
	"fmt"
	"os"
)

const usage = `usage: onebitd <command> [flags]

commands:
  serve          run the daemon (see 'onebitd serve -h')
  watch          print handoff events from NATS as they happen
  dashboard      serve a live web dashboard of every node on a NATS server
  replay         rebuild and audit requests from event logs or a JetStream stream
  probe-decoder  check a decoder's slot and share/adopt conformance
`

func main() { os.Exit(run(os.Args[1:])) }

func run(args []string) int {
	if len(args) == 0 {
		fmt.Fprint(os.Stderr, usage)
		return 2
	}
	switch args[0] {
	case "serve":
		return serveMain(args[1:])
	case "watch":
		return watchMain(args[1:])
	case "dashboard":
		return dashboardMain(args[1:])
	case "replay":
		return replayMain(args[1:])
	case "probe-decoder":
		return probeMain(args[1:])
	case "-h", "-help", "--help", "help":
		fmt.Print(usage)
		return 0
	}
	fmt.Fprintf(os.Stderr, "onebitd: unknown command %q\n\n%s", args[0], usage)
	return 2
}
