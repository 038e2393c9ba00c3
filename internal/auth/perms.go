package auth

import (
	"github.com/nats-io/jwt/v2"

	"github.com/fanin-ml/fanin/wire"
)

const jobTagPrefix = "fanin-job:"

// JobTag marks a user JWT as a job's credentials.
func JobTag(job string) string { return jobTagPrefix + job }

// InboxPrefix is the inbox prefix a job's worker connections use (nats.CustomInboxPrefix, `nats
// --inbox-prefix`): replies to the job's requests (publish acknowledgements, direct gets) come
// to inboxes no other job may subscribe to. With the default _INBOX prefix, anyone allowed to
// read _INBOX.> would read other jobs' parameters off their direct-get replies.
func InboxPrefix(job string) string { return "_INBOX_" + job }

// JobPermissions are what a job's workers may do, and nothing more:
//
//	publish   fanin.v1.<job>.grad.*                       gradients (JetStream publish)
//	          fanin.v1.<job>.params.*                     step-0 parameters, only for init "upload"
//	          $JS.API.DIRECT.GET.FANIN_PARAMS_<job>[.fanin.v1.<job>.params.*]   fetch parameters
//	          $JS.API.STREAM.MSG.GET.FANIN_PARAMS_<job>   the same without direct get (nats stream get)
//	          $JS.API.STREAM.INFO.FANIN_PARAMS_<job>      open the parameter stream
//	          $JS.API.STREAM.INFO.KV_fanin-jobs           open the jobs bucket ...
//	          $JS.API.DIRECT.GET.KV_fanin-jobs.$KV.fanin-jobs.<job>   ... and read this job's record
//	subscribe fanin.v1.<job>.params.*                     pushed parameters
//	          fanin.v1.<job>.rejects                      the job's rejections
//	          _INBOX_<job>.>                              replies (see InboxPrefix)
//
// Publish permissions do not depend on a message's body, so the body form of a direct get on
// the job's own parameter stream may name any of its subjects: all of them are the job's.
func JobPermissions(job string, upload bool) jwt.Permissions {
	params := wire.ParamsStream(job)
	var p jwt.Permissions
	p.Pub.Allow.Add(
		wire.GradWildcard(job),
		"$JS.API.DIRECT.GET."+params,
		"$JS.API.DIRECT.GET."+params+"."+wire.ParamsWildcard(job),
		"$JS.API.STREAM.MSG.GET."+params,
		"$JS.API.STREAM.INFO."+params,
		"$JS.API.STREAM.INFO.KV_"+wire.JobsBucket,
		"$JS.API.DIRECT.GET.KV_"+wire.JobsBucket+".$KV."+wire.JobsBucket+"."+job,
	)
	if upload {
		p.Pub.Allow.Add(wire.ParamsWildcard(job))
	}
	p.Sub.Allow.Add(wire.ParamsWildcard(job), wire.RejectsSubject(job), InboxPrefix(job)+".>")
	return p
}
