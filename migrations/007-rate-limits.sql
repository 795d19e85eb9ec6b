-- Rate-limit counters shared by every instance when there is no Redis: one row per key and
-- fixed window. UNLOGGED: no WAL, emptied after a crash, which only forgets some counts.
CREATE UNLOGGED TABLE rate_limit_hits (
  key           TEXT NOT NULL,
  window_start  BIGINT NOT NULL,
  window_end    BIGINT NOT NULL,
  count         INTEGER NOT NULL,
  PRIMARY KEY (key, window_start)
);
CREATE INDEX rate_limit_hits_end ON rate_limit_hits (window_end);
