// Package scaleout holds the acceptance test of issue 14: several onebitd
// nodes publishing into one JetStream stream replicated on a three-server
// NATS cluster, through a NATS server restart, a link cut longer than the
// reconnect buffer and a kill -9, end with the stream equal to the union
// of the nodes' event logs. Everything runs on loopback; the nats-servers
// are embedded in the test, onebitd and the decoder simulator are real
// processes. It has no non-test code.
//
// The stream may store a few events of a boot out of seq order after a
// failure (a server dying with acknowledgements pending: later publishes
// were stored before the catch-up republished the lost ones); the test
// checks the order as bus.StreamEvents (and replay --stream) read it.
package scaleout
