-- The template catalogue and the image store (docs/templates.md). A template is a row an operator
-- manages; its disk image is content in the image store, named by its SHA-256, which every host
-- with an agent downloads. A fresh install has the specification's templates 100 to 104, with no
-- image yet: hosts that hold them were given them by hand (gpucloud agent template add).

CREATE TABLE images (
  sha256              TEXT PRIMARY KEY CHECK (sha256 ~ '^[0-9a-f]{64}$'),
  format              TEXT NOT NULL CHECK (format IN ('qcow2', 'raw')),
  size_bytes          BIGINT NOT NULL CHECK (size_bytes > 0),
  virtual_size_bytes  BIGINT NOT NULL CHECK (virtual_size_bytes > 0),
  created_at          TIMESTAMPTZ NOT NULL
);

CREATE TABLE templates (
  template_vmid  INTEGER PRIMARY KEY CHECK (template_vmid BETWEEN 100 AND 999999),
  name           TEXT NOT NULL UNIQUE,
  description    TEXT NOT NULL,
  os             TEXT NOT NULL,
  default_user   TEXT NOT NULL,
  webui_port     INTEGER CHECK (webui_port BETWEEN 1 AND 65535),
  jupyter_port   INTEGER CHECK (jupyter_port BETWEEN 1 AND 65535),
  min_disk_gb    INTEGER NOT NULL DEFAULT 50 CHECK (min_disk_gb BETWEEN 1 AND 100000),
  -- NULL: every GPU type's nodes hold it.
  gpu_types      TEXT[],
  image_sha256   TEXT REFERENCES images (sha256),
  created_at     TIMESTAMPTZ NOT NULL,
  updated_at     TIMESTAMPTZ NOT NULL
);

INSERT INTO templates (template_vmid, name, description, os, default_user, webui_port, jupyter_port, created_at, updated_at) VALUES
  (100, 'ubuntu-22.04', 'Ubuntu 22.04 base image with GPU drivers', 'Ubuntu 22.04', 'ubuntu', NULL, NULL, '2026-01-01T00:00:00Z', '2026-01-01T00:00:00Z'),
  (101, 'ubuntu-24.04', 'Ubuntu 24.04 base image with GPU drivers', 'Ubuntu 24.04', 'ubuntu', NULL, NULL, '2026-01-01T00:00:00Z', '2026-01-01T00:00:00Z'),
  (102, 'stable-diffusion', 'Stable-diffusion image-generation image, pre-configured', 'Ubuntu 22.04', 'ubuntu', 7860, 8888, '2026-01-01T00:00:00Z', '2026-01-01T00:00:00Z'),
  (103, 'comfyui', 'Node-based image/video/audio generation image', 'Ubuntu 22.04', 'ubuntu', 8188, 8888, '2026-01-01T00:00:00Z', '2026-01-01T00:00:00Z'),
  (104, 'desktop', 'Web-accessible Linux desktop', 'Ubuntu 22.04', 'ubuntu', 6080, 8888, '2026-01-01T00:00:00Z', '2026-01-01T00:00:00Z');

-- A VM's template is any of the catalogue's ids (the range an operator may use).
ALTER TABLE vms DROP CONSTRAINT vms_template_vmid_check;
ALTER TABLE vms ADD CONSTRAINT vms_template_vmid_check CHECK (template_vmid BETWEEN 100 AND 999999);

-- What each host's agent reported about each template, replaced at every heartbeat. A template the
-- catalogue does not know (a local one) is kept too: it shows on the node's page.
CREATE TABLE node_templates (
  node           TEXT NOT NULL REFERENCES nodes (node) ON DELETE CASCADE,
  template_vmid  INTEGER NOT NULL,
  state          TEXT NOT NULL CHECK (state IN ('queued', 'downloading', 'ready', 'failed')),
  source         TEXT NOT NULL CHECK (source IN ('pulled', 'local')),
  sha256         TEXT,
  bytes_done     BIGINT NOT NULL DEFAULT 0,
  size_bytes     BIGINT NOT NULL DEFAULT 0,
  reason         TEXT,
  updated_at     TIMESTAMPTZ NOT NULL,
  PRIMARY KEY (node, template_vmid)
);
CREATE INDEX node_templates_ready ON node_templates (template_vmid) WHERE state = 'ready';

-- An image upload in progress: its bytes arrive in ranges (each request short, so that request timeouts
-- and proxies' body limits allow any size, and a broken upload resumes where it stopped) into a file of
-- the image store's; completing it checks the whole file and adds it to `images`.
CREATE TABLE image_uploads (
  id             UUID PRIMARY KEY,
  size_bytes     BIGINT NOT NULL CHECK (size_bytes > 0),
  received_bytes BIGINT NOT NULL DEFAULT 0 CHECK (received_bytes >= 0 AND received_bytes <= size_bytes),
  sha256         TEXT CHECK (sha256 ~ '^[0-9a-f]{64}$'),
  template_vmid  INTEGER REFERENCES templates (template_vmid) ON DELETE SET NULL,
  created_at     TIMESTAMPTZ NOT NULL,
  expires_at     TIMESTAMPTZ NOT NULL
);
