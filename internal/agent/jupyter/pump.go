package jupyter

import (
	"sync"

	"github.com/pandastack/pandastack/internal/agentproto"
)

// eventPump hands a cell's events to the caller's onEvent on a goroutine
// of its own, in order. The run's wait watches the cell's deadline and
// the kernel's death between events; with onEvent called there, a client
// that kept the stream open but stopped reading held onEvent in its
// write, and the cell ran on past its timeout for as long.
//
// What waits here is what the run would otherwise hold in its pending
// events: the stream text is capped by the run (ExecOptions.OutputCap).
type eventPump struct {
	mu     sync.Mutex
	queue  []agentproto.CodeEvent
	closed bool
	wake   chan struct{} // a token when queue or closed changed
	done   chan struct{} // closed once the pump delivered all and stopped
}

func newEventPump(onEvent func(agentproto.CodeEvent)) *eventPump {
	p := &eventPump{wake: make(chan struct{}, 1), done: make(chan struct{})}
	go p.run(onEvent)
	return p
}

// send queues ev for delivery.
func (p *eventPump) send(ev agentproto.CodeEvent) {
	p.mu.Lock()
	p.queue = append(p.queue, ev)
	p.mu.Unlock()
	p.poke()
}

func (p *eventPump) poke() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

func (p *eventPump) run(onEvent func(agentproto.CodeEvent)) {
	defer close(p.done)
	for {
		p.mu.Lock()
		evs, closed := p.queue, p.closed
		p.queue = nil
		p.mu.Unlock()
		for _, ev := range evs {
			onEvent(ev)
		}
		if len(evs) > 0 {
			continue
		}
		if closed {
			return
		}
		<-p.wake
	}
}

// close waits until every event sent was delivered: the caller's answer
// comes after them, and onEvent is not called once Execute returned.
func (p *eventPump) close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.poke()
	<-p.done
}
