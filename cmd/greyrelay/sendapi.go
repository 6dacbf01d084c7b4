package main

import (
	"time"

	"github.com/greyrelay/greyrelay/queue"
)

// findSubmitted is the sending API's Options.Find: a message user
// submitted with messageID since the given time, queued or in the history.
func findSubmitted(q *queue.Queue) func(user, messageID string, since time.Time) (string, bool, error) {
	return func(user, messageID string, since time.Time) (string, bool, error) {
		rows, _, err := q.List(queue.Filter{MessageID: messageID})
		if err != nil { // an unsettled queue may lack it: that cannot be told
			return "", false, err
		}
		for _, r := range rows {
			if r.Message.AuthUser == user && !r.Message.Arrival.Before(since) {
				return r.Message.ID.String(), true, nil
			}
		}
		return "", false, nil
	}
}
