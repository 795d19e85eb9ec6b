/**
 * The JSON of the image store: each TypeBox schema is the one definition of its shape, the OpenAPI
 * document's and ImageService's type alike (docs/templates.md#pushing-an-image).
 */
import { Type, type Static } from 'typebox';
import { DateTime, Nullable } from '../../http/schemas.js';

export const ImageSchema = Type.Object(
  {
    sha256: Type.String(),
    format: Type.String({ description: 'qcow2 or raw' }),
    size_bytes: Type.Integer(),
    virtual_size_bytes: Type.Integer({ description: 'The size of the disk it holds' }),
    templates: Type.Array(Type.Integer(), { description: 'The templates whose image it is' }),
    created_at: DateTime(),
  },
  { description: 'A disk image in the image store, named by its SHA-256' },
);
export type ImageRecord = Static<typeof ImageSchema>;

export const UploadSchema = Type.Object(
  {
    id: Type.String({ format: 'uuid' }),
    size_bytes: Type.Integer(),
    received_bytes: Type.Integer({ description: 'Where the next range starts' }),
    sha256: Nullable(Type.String(), { description: 'The checksum the upload must have, when given' }),
    template_vmid: Nullable(Type.Integer(), { description: 'The template it becomes the image of, when given' }),
    created_at: DateTime(),
    expires_at: DateTime('An upload not completed by then is forgotten'),
  },
  { description: 'An image upload in progress' },
);
export type UploadRecord = Static<typeof UploadSchema>;
