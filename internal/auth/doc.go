// Package auth is fanin's security on NATS and HTTP: an operator-mode NATS deployment (operator,
// system account, fanin account with a signing key), the credentials of fanin's own components,
// per-job credentials that reach only one job's subjects, and the API's bearer tokens.
package auth
