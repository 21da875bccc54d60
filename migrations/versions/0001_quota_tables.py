"""flask-quota's tables: plans, plan limits, clients, overrides, audit log, meta.

Revision ID: 0001_quota_tables
Revises:
Create Date: 2026-11-30 04:39:01.314697

Keep flask_quota.sql.models.SCHEMA_REVISION equal to the newest revision here: the
extension stamps it when it creates the tables itself.
"""
from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision = '0001_quota_tables'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('quota_audit_log',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('actor', sa.String(length=200), nullable=False),
    sa.Column('action', sa.String(length=64), nullable=False),
    sa.Column('target', sa.String(length=200), nullable=False),
    sa.Column('before', sa.JSON(), nullable=True),
    sa.Column('after', sa.JSON(), nullable=True),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_quota_audit_log'))
    )
    with op.batch_alter_table('quota_audit_log', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_quota_audit_log_at'), ['at'], unique=False)

    op.create_table('quota_meta',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('version', sa.BigInteger(), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_quota_meta'))
    )
    op.create_table('quota_plans',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=64), nullable=False),
    sa.Column('description', sa.Text(), nullable=False),
    sa.Column('upgrade_hint', sa.Text(), nullable=True),
    sa.Column('position', sa.Integer(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_quota_plans')),
    sa.UniqueConstraint('name', name=op.f('uq_quota_plans_name'))
    )
    op.create_table('quota_clients',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('plan_id', sa.Integer(), nullable=False),
    sa.Column('key_prefix', sa.String(length=16), nullable=False),
    sa.Column('key_salt', sa.String(length=64), nullable=False),
    sa.Column('key_hash', sa.String(length=128), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('revoked_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['plan_id'], ['quota_plans.id'], name=op.f('fk_quota_clients_plan_id_quota_plans')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_quota_clients')),
    sa.UniqueConstraint('key_prefix', name=op.f('uq_quota_clients_key_prefix')),
    sa.UniqueConstraint('name', name=op.f('uq_quota_clients_name'))
    )
    op.create_table('quota_plan_limits',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('plan_id', sa.Integer(), nullable=False),
    sa.Column('tier', sa.String(length=16), nullable=False),
    sa.Column('resource', sa.String(length=64), nullable=False),
    sa.Column('rate', sa.String(length=100), nullable=False),
    sa.Column('algorithm', sa.String(length=32), nullable=True),
    sa.Column('shadow', sa.Boolean(), nullable=False),
    sa.CheckConstraint("(tier = 'endpoint' AND resource <> '') OR (tier <> 'endpoint' AND resource = '')", name=op.f('ck_quota_plan_limits_resource')),
    sa.CheckConstraint("tier IN ('global', 'user', 'endpoint')", name=op.f('ck_quota_plan_limits_tier')),
    sa.ForeignKeyConstraint(['plan_id'], ['quota_plans.id'], name=op.f('fk_quota_plan_limits_plan_id_quota_plans'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_quota_plan_limits')),
    sa.UniqueConstraint('plan_id', 'tier', 'resource', name=op.f('uq_quota_plan_limits_plan_id_tier_resource'))
    )
    op.create_table('quota_overrides',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('client_id', sa.Integer(), nullable=False),
    sa.Column('tier', sa.String(length=16), nullable=False),
    sa.Column('resource', sa.String(length=64), nullable=False),
    sa.Column('rate', sa.String(length=100), nullable=False),
    sa.Column('expires_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.CheckConstraint("(tier = 'endpoint' AND resource <> '') OR (tier <> 'endpoint' AND resource = '')", name=op.f('ck_quota_overrides_resource')),
    sa.CheckConstraint("tier IN ('global', 'user', 'endpoint')", name=op.f('ck_quota_overrides_tier')),
    sa.ForeignKeyConstraint(['client_id'], ['quota_clients.id'], name=op.f('fk_quota_overrides_client_id_quota_clients'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_quota_overrides')),
    sa.UniqueConstraint('client_id', 'tier', 'resource', name=op.f('uq_quota_overrides_client_id_tier_resource'))
    )


def downgrade() -> None:
    op.drop_table('quota_overrides')
    op.drop_table('quota_plan_limits')
    op.drop_table('quota_clients')
    op.drop_table('quota_plans')
    op.drop_table('quota_meta')
    with op.batch_alter_table('quota_audit_log', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_quota_audit_log_at'))

    op.drop_table('quota_audit_log')
