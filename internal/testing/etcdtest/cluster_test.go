package etcdtest

import (
	"context"
	"testing"
	"time"
)

func TestClusterSurvivesOneMemberAndRestarts(t *testing.T) {
	c := StartCluster(t, 3)
	cli := c.Client(t)
	c.WaitHealthy(t, cli)
	c.Stop(0)
	c.WaitHealthy(t, cli) // two of three: still a quorum
	c.Restart(0)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := cli.Put(ctx, "k", "v"); err != nil {
		t.Fatalf("put after restart: %v", err)
	}
}
