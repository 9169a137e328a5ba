"""The users domain: whose memory it is (resolving the user a request names, and forgetting
one)."""
