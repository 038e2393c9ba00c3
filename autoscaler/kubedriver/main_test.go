package kubedriver_test

import (
	"testing"

	"github.com/fanin-ml/fanin/lab/testutil"
)

func TestMain(m *testing.M) { testutil.VerifyNoLeaks(m) }
