package main

import "github.com/onebitd/onebitd/bus"

// replay --nats-url … --stream ONEBIT reads through the NATS bus.
func init() { streamSource = bus.StreamEvents }
