package events

// ReplaySocketHWM is the replay ROUTER's send queue per client, as the
// socket was configured.
func ReplaySocketHWM(p *Publisher) int { return p.replay.Config().HWM }
