-- Each user's credit balance (docs/billing.md#the-balance), in a narrow table the billing module owns:
-- every change of a balance writes one ledger transaction in the same database transaction, and a
-- close rewrites the balances of every user it charges, which costs a fraction of rewriting the
-- users' wide rows. The user's row (email, password, limits) is no longer locked to move money.
CREATE TABLE balances (
  user_id              BIGINT PRIMARY KEY REFERENCES users (id) ON DELETE CASCADE,
  -- The sum of the user's transactions, in micro-units.
  balance_micros       BIGINT NOT NULL DEFAULT 0,
  -- Set when a charge leaves the balance at or below zero; the low-balance job stops the user's
  -- running VMs and clears it.
  low_balance_pending  BOOLEAN NOT NULL DEFAULT false
);
CREATE INDEX balances_low ON balances (user_id) WHERE low_balance_pending;

-- Every user has a balance from the moment the account exists, however it is made.
CREATE FUNCTION open_balance() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO balances (user_id) VALUES (NEW.id);
  RETURN NEW;
END
$$;
CREATE TRIGGER users_open_balance AFTER INSERT ON users FOR EACH ROW EXECUTE FUNCTION open_balance();

INSERT INTO balances (user_id, balance_micros, low_balance_pending)
  SELECT id, balance_micros, low_balance_pending FROM users;
ALTER TABLE users DROP COLUMN balance_micros;
ALTER TABLE users DROP COLUMN low_balance_pending;
