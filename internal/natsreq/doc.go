// Package natsreq sends requests over NATS that cannot hang: every attempt has its own deadline,
// and a request whose reply was lost is sent again while the caller's context lives.
package natsreq
