package runtime

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fanin-ml/fanin/internal/natsreq"
)

// lastFromLeader reads the newest message on subject of stream from the stream's leader: a
// JetStream "message get" ($JS.API.STREAM.MSG.GET), which only the leader answers.
//
// A restore must not read its snapshot any other way. The parameters stream allows direct gets
// (workers fetch parameters from any replica), and nats.go's GetLastMsgForSubject uses them when
// the stream allows it; a replica answers direct gets once it is 90% caught up, so in a cluster a
// lagging one can return a snapshot older than one whose storage was acknowledged, after the
// gradients between the two were purged: the shard would replay from gradients that are gone and
// never apply them. The leader has every acknowledged message.
func lastFromLeader(ctx context.Context, nc *nats.Conn, stream, subject string) (*jetstream.RawStreamMsg, error) {
	req, err := json.Marshal(struct {
		LastBy string `json:"last_by_subj"`
	}{subject})
	if err != nil {
		return nil, err
	}
	// Each attempt has its own deadline: a reply lost with a dying leader is asked for again of
	// the next one, not waited for with the shard's context, which has none.
	m, err := natsreq.Request(ctx, nc, "$JS.API.STREAM.MSG.GET."+stream, req)
	if err != nil {
		return nil, fmt.Errorf("get the last message of %s from %s's leader: %w", subject, stream, err)
	}
	var resp struct {
		Error *struct {
			Code        int    `json:"code"`
			ErrCode     int    `json:"err_code"`
			Description string `json:"description"`
		} `json:"error"`
		Message *struct {
			Subject string    `json:"subject"`
			Seq     uint64    `json:"seq"`
			Hdrs    []byte    `json:"hdrs"`
			Data    []byte    `json:"data"`
			Time    time.Time `json:"time"`
		} `json:"message"`
	}
	if err := json.Unmarshal(m.Data, &resp); err != nil {
		return nil, fmt.Errorf("get the last message of %s from %s's leader: %w", subject, stream, err)
	}
	switch {
	case resp.Error != nil && resp.Error.ErrCode == int(jetstream.JSErrCodeMessageNotFound):
		return nil, jetstream.ErrMsgNotFound
	case resp.Error != nil:
		return nil, fmt.Errorf("get the last message of %s from %s's leader: %s (%d)", subject, stream, resp.Error.Description, resp.Error.ErrCode)
	case resp.Message == nil:
		return nil, fmt.Errorf("get the last message of %s from %s's leader: %w", subject, stream, jetstream.ErrInvalidJetStreamResponse)
	}
	var hdr nats.Header
	if len(resp.Message.Hdrs) > 0 {
		if hdr, err = nats.DecodeHeadersMsg(resp.Message.Hdrs); err != nil {
			return nil, fmt.Errorf("get the last message of %s from %s's leader: headers: %w", subject, stream, err)
		}
	}
	return &jetstream.RawStreamMsg{Subject: resp.Message.Subject, Sequence: resp.Message.Seq, Header: hdr,
		Data: resp.Message.Data, Time: resp.Message.Time}, nil
}
