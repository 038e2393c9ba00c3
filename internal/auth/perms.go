package auth

import (
	"github.com/nats-io/jwt/v2"

	"github.com/fanin-ml/fanin/wire"
)

const jobTagPrefix = "fanin-job:"

// JobTag marks a user or account JWT as a job's.
func JobTag(job string) string { return jobTagPrefix + job }

// JobPermissions are what a job's workers may do inside the job's own account. The account
// boundary is what isolates jobs from fanin and from each other (accounts.go); these permissions
// narrow, within the job, what its credentials can do:
//
//	publish   fanin.v1.<job>.grad.*                        gradients (JetStream publish, acknowledged; direct: a request the runtime answers)
//	          fanin.v1.<job>.init.*                        step-0 parameters, only for init "upload"
//	          $JS.API.DIRECT.GET.FANIN_PARAMS_<job>[.fanin.v1.<job>.params.*]   fetch parameters
//	          $JS.API.DIRECT.GET.KV_fanin-jobs.$KV.fanin-jobs.<job>             read the job's record
//	          $JS.API.DIRECT.GET.KV_fanin-assign.$KV.fanin-assign.<job>         read the workers' assignment
//	          fanin.v1.<job>.workers                       elastic workers' beats (core NATS)
//	subscribe fanin.v1.<job>.params.*                      pushed parameters
//	          fanin.v1.<job>.resend.*                      direct-gradient jobs: "send again from step s"
//	          fanin.v1.<job>.rejects                       the job's rejections
//	          fanin.v1.<job>.inbox.>, _INBOX.>             replies (wire.InboxPrefix; _INBOX for clients
//	                                                       that cannot set an inbox prefix)
//
// Nothing may publish to the parameter subjects: inside the account, a publish there would reach
// the other workers' subscriptions.
func JobPermissions(job string, upload bool) jwt.Permissions {
	params := wire.ParamsStream(job)
	var p jwt.Permissions
	p.Pub.Allow.Add(
		wire.GradWildcard(job),
		wire.DirectGet(params),
		wire.DirectGetLast(params, wire.ParamsWildcard(job)),
		wire.JobRecordGet(job),
		wire.AssignmentGet(job),
		wire.WorkersSubject(job),
	)
	if upload {
		p.Pub.Allow.Add(wire.InitWildcard(job))
	}
	p.Sub.Allow.Add(wire.ParamsWildcard(job), wire.ResendWildcard(job), wire.RejectsSubject(job), wire.InboxWildcard(job), "_INBOX.>")
	return p
}
