-- Lists are newest first (D3); with a manual clock many rows share a timestamp, so order by insertion.
ALTER TABLE api_keys ADD COLUMN seq BIGINT GENERATED ALWAYS AS IDENTITY;
ALTER TABLE ssh_keys ADD COLUMN seq BIGINT GENERATED ALWAYS AS IDENTITY;
