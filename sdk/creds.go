package sdk

import (
	"errors"
	"strings"

	"github.com/nats-io/nats.go"

	"github.com/fanin-ml/fanin/gateway/api"
	"github.com/fanin-ml/fanin/wire"
)

// WithJobCredentials connects with a job's NATS credentials, as returned at the job's creation
// (api.JobCreated.Credentials) or by Admin.NewCredentials: the user's JWT and seed, and the job's
// inbox prefix, without which the server refuses the connection's replies.
func WithJobCredentials(c *api.Credentials) Option {
	return func(cl *Client) error {
		if c == nil || c.JWT == "" || c.Seed == "" {
			return errors.New("job credentials: no JWT or seed")
		}
		cl.credJob = jobOfInbox(c.InboxPrefix)
		return WithNATSOptions(nats.UserJWTAndSeed(c.JWT, c.Seed), nats.CustomInboxPrefix(c.InboxPrefix))(cl)
	}
}

// jobOfInbox is the job whose reply namespace the inbox prefix is (wire.InboxPrefix), or "".
func jobOfInbox(prefix string) string {
	job, ok := strings.CutPrefix(prefix, wire.Prefix)
	if job, ok2 := strings.CutSuffix(job, ".inbox"); ok && ok2 && validJobID(job) {
		return job
	}
	return ""
}

// WithCredentialsFile connects with a .creds file of a job (api.Credentials.Creds saved to a file)
// and the job's inbox prefix (api.Credentials.InboxPrefix, "_INBOX_<job>").
func WithCredentialsFile(path, inboxPrefix string) Option {
	opts := []nats.Option{nats.UserCredentials(path)}
	if inboxPrefix != "" {
		opts = append(opts, nats.CustomInboxPrefix(inboxPrefix))
	}
	return func(cl *Client) error {
		cl.credJob = jobOfInbox(inboxPrefix)
		return WithNATSOptions(opts...)(cl)
	}
}
